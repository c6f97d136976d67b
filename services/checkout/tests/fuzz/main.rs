//! Property tests of checkout's two parsers of untrusted input: the
//! `POST /v1/orders` body and the PSP's signed webhooks. Each property runs
//! 256 cases by default; `PROPTEST_CASES` raises it (docs/fuzzing.md).

mod request;
mod webhooks;

use proptest::prelude::*;
use serde_json::Value;

/// Any JSON value without floats, nested a few levels.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Numbers with the edges a quantity parser must survive weighted in.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        prop::sample::select(vec![
            Value::from(0),
            Value::from(1),
            Value::from(-1),
            Value::from(domain::stock::MAX_LINE_QUANTITY),
            Value::from(domain::stock::MAX_LINE_QUANTITY + 1),
            Value::from(i64::MIN),
            Value::from(i64::MAX),
            Value::from(u64::MAX),
            Value::from(1.5),
            Value::from(1e300),
        ]),
    ]
}
