//! Fuzz target: `tollgate_cli::fuzzing::admin_text` must not panic on any input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tollgate_cli::fuzzing::admin_text(data);
});
