//! How much the HTTP path allocates to turn a request body into a validated
//! order request, counted with dhat's heap profiler in testing mode (this
//! test is its own binary, so nothing else allocates while it measures).
//! The bound is a regression guard; the figure is printed for the
//! benchmark notes.

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

#[test]
fn parsing_a_typical_order_allocates_little() {
    let body = axum::body::Bytes::from_static(
        br#"{"lines":[{"sku":"TSHIRT-BLACK-M","quantity":1}],"shipping":{"name":"Ana Souza","line1":"Rua A, 1","city":"Porto Alegre","postal_code":"90000-000","country":"BR"}}"#,
    );
    let _profiler = dhat::Profiler::builder().testing().build();
    // Warm up (lazy statics, first-use buffers).
    checkout::request::parse(&body).expect("valid");
    let runs = 1_000;
    let before = dhat::HeapStats::get();
    for _ in 0..runs {
        std::hint::black_box(checkout::request::parse(&body).expect("valid"));
    }
    let after = dhat::HeapStats::get();
    let per_request = (after.total_blocks - before.total_blocks) / runs;
    let bytes = (after.total_bytes - before.total_bytes) / runs;
    println!("request::parse: {per_request} allocations, {bytes} bytes per request");
    assert!(
        per_request <= 30,
        "parsing allocates {per_request} times per request"
    );
}
