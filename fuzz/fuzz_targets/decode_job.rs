//! Arbitrary bytes into the job decoder: it must never panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mailgate::wire::decode(data);
});
