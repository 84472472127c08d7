//! Fuzz target: `tollgate_cli::fuzzing::scenario` must not panic on any input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tollgate_cli::fuzzing::scenario(data);
});
