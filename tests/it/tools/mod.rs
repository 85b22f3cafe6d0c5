//! What users run and read: the command line, the README's producer, the
//! shipped configs, and settings from the environment.

mod admin;
mod cli;
mod contract;
mod docs_configs;
mod example_producer;
mod layout;
mod queues;
mod settings;
mod support;
