//! The job path: the worker end to end, the pipeline's decisions, queue
//! types, the job decoder, the operator's HTTP endpoint, and traces.

mod decode;
mod end_to_end;
mod http;
mod pipeline;
mod queue_type;
mod traces;
