//! stub
#[test]
fn stub() {
    let _ = env!("GUEST_HELLO");
    let _ = wasm_smith::Config::default();
    let _ = proptest::test_runner::Config::default();
}
