//! `checkout::request::parse`: the `POST /v1/orders` body. It must never
//! panic, accept exactly the documented bounds, and keep what it accepts.

use super::{json, number};
use axum::body::Bytes;
use checkout::request::{parse, OrderRequest};
use domain::order::MAX_LINES;
use domain::stock::MAX_LINE_QUANTITY;
use domain::Shipping;
use proptest::prelude::*;
use serde_json::{json, Value};

const SKU: &str = "[A-Za-z0-9._-]{1,64}";

fn is_sku(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// One line of printable text: no control character (C0, DEL, C1), no
/// line or paragraph separator, not blank, at most 200 characters.
fn is_address_field(s: &str) -> bool {
    !s.trim().is_empty()
        && s.chars().count() <= 200
        && !s
            .chars()
            .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}')
}

fn is_country(s: &str) -> bool {
    s.len() == 2 && s.bytes().all(|b| b.is_ascii_uppercase())
}

/// The documented bounds, checked on every request the parser accepts.
fn assert_within_bounds(req: &OrderRequest) -> Result<(), TestCaseError> {
    prop_assert!(
        (1..=MAX_LINES).contains(&req.lines.len()),
        "{} lines",
        req.lines.len()
    );
    for (i, (sku, quantity)) in req.lines.iter().enumerate() {
        prop_assert!(is_sku(sku.as_str()), "sku {:?}", sku);
        prop_assert!(
            (1..=MAX_LINE_QUANTITY).contains(&quantity.get()),
            "quantity {}",
            quantity.get()
        );
        prop_assert!(
            req.lines[..i].iter().all(|(other, _)| other != sku),
            "{} repeated",
            sku
        );
    }
    if let Some(s) = &req.shipping {
        for field in [&s.name, &s.line1, &s.city, &s.postal_code] {
            prop_assert!(is_address_field(field), "shipping field {:?}", field);
        }
        prop_assert!(is_country(&s.country), "country {:?}", s.country);
    }
    Ok(())
}

fn sku_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => SKU,
        1 => Just(String::new()),
        1 => "[A-Za-z0-9._-]{65,70}",
        1 => "[A-Za-z0-9 ./_é-]{1,8}",
        1 => any::<String>(),
    ]
}

fn quantity() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => 1..=MAX_LINE_QUANTITY,
        1 => prop::sample::select(vec![0, -1, MAX_LINE_QUANTITY + 1, i64::MIN, i64::MAX]),
        1 => any::<i64>(),
    ]
}

fn address_field() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        8 => "[^\\s\\p{Cc}]{1,40}",
        2 => "[^\\s]{0,8}[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}\\u{2028}\\u{2029}][^\\s]{0,8}",
        1 => Just(String::new()),
        1 => Just(" \t\u{a0}".to_owned()),
        1 => Just("x".repeat(200)),
        1 => Just("é".repeat(200)),
        1 => Just("é".repeat(201)),
        1 => any::<String>(),
    ]
}

fn country() -> impl Strategy<Value = String> {
    prop_oneof![4 => "[A-Z]{2}", 1 => "[A-Za-z]{0,3}", 1 => Just("ÉÉ".to_owned()), 1 => any::<String>()]
}

fn shipping(
    field: impl Strategy<Value = String> + Clone,
    country: impl Strategy<Value = String>,
) -> impl Strategy<Value = Shipping> {
    (field.clone(), field.clone(), field.clone(), field, country).prop_map(
        |(name, line1, city, postal_code, country)| Shipping {
            name,
            line1,
            city,
            postal_code,
            country,
        },
    )
}

fn valid_shipping() -> impl Strategy<Value = Option<Shipping>> {
    prop::option::of(shipping(
        "[^\\s\\p{Cc}]{1,40}( [^\\s\\p{Cc}]{1,40})?",
        "[A-Z]{2}",
    ))
}

/// `n` distinct valid SKUs in random order, each with a valid quantity.
fn valid_lines(
    n: impl Into<prop::collection::SizeRange>,
) -> impl Strategy<Value = Vec<(String, i64)>> {
    prop::collection::btree_set(SKU, n)
        .prop_map(Vec::from_iter)
        .prop_shuffle()
        .prop_flat_map(|skus| {
            let n = skus.len();
            (Just(skus), prop::collection::vec(1..=MAX_LINE_QUANTITY, n))
        })
        .prop_map(|(skus, quantities)| skus.into_iter().zip(quantities).collect())
}

fn body(lines: &[(String, i64)], shipping: Option<&Shipping>) -> Value {
    let lines: Vec<Value> = lines
        .iter()
        .map(|(sku, quantity)| json!({ "sku": sku, "quantity": quantity }))
        .collect();
    match shipping {
        Some(s) => json!({ "lines": lines, "shipping": s }),
        None => json!({ "lines": lines }),
    }
}

fn parse_value(body: &Value) -> Result<OrderRequest, String> {
    let bytes = serde_json::to_vec(body).map_err(|e| e.to_string())?;
    parse(&Bytes::from(bytes)).map_err(|e| e.to_string())
}

/// A value shaped like an order body, with arbitrary values where the real ones go.
fn body_like() -> impl Strategy<Value = Value> {
    let field = prop_oneof![number(), sku_text().prop_map(Value::String), json()];
    let line = prop::collection::btree_map(
        prop_oneof![
            Just("sku".to_owned()),
            Just("quantity".to_owned()),
            any::<String>()
        ],
        field,
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()));
    let lines =
        prop_oneof![4 => prop::collection::vec(line, 0..6).prop_map(Value::Array), 1 => json()];
    let shipping = prop_oneof![
        shipping(address_field(), country())
            .prop_map(|s| serde_json::to_value(s).unwrap_or_default()),
        json(),
    ];
    (
        lines,
        prop::option::of(shipping),
        prop::option::of((any::<String>(), json())),
    )
        .prop_map(|(lines, shipping, extra)| {
            let mut body = serde_json::Map::new();
            body.insert("lines".into(), lines);
            if let Some(s) = shipping {
                body.insert("shipping".into(), s);
            }
            if let Some((k, v)) = extra {
                body.insert(k, v);
            }
            Value::Object(body)
        })
}

/// A body whose lines are arrays with one element too many.
fn over_long_line() -> impl Strategy<Value = Value> {
    (valid_lines(1..3), json()).prop_map(|(lines, extra)| {
        let lines: Vec<Value> = lines
            .iter()
            .map(|(sku, q)| json!([sku, q, extra]))
            .collect();
        json!({ "lines": lines })
    })
}

/// Edits a valid body's text a few bytes at a time, to reach past the first syntax check.
fn mangled_body() -> impl Strategy<Value = Vec<u8>> {
    let edits = prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..6);
    (valid_lines(1..4), valid_shipping(), edits).prop_map(|(lines, shipping, edits)| {
        let mut bytes = serde_json::to_vec(&body(&lines, shipping.as_ref())).unwrap_or_default();
        for (at, byte, kind) in edits {
            let i = at.index(bytes.len() + 1);
            match kind {
                0 => bytes.insert(i, byte),
                1 if i < bytes.len() => bytes[i] = byte,
                _ if i < bytes.len() => {
                    bytes.remove(i);
                }
                _ => {}
            }
        }
        bytes
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_the_order_parser(
        bytes in prop_oneof![prop::collection::vec(any::<u8>(), 0..512), mangled_body()],
    ) {
        if let Ok(req) = parse(&Bytes::from(bytes)) {
            assert_within_bounds(&req)?;
        }
    }

    #[test]
    fn arbitrary_json_never_panics_the_order_parser_and_what_it_accepts_is_within_bounds(
        body in prop_oneof![json(), body_like()],
    ) {
        if let Ok(req) = parse_value(&body) {
            assert_within_bounds(&req)?;
        }
    }

    // Fails today on `[[], null, null]` and `{"lines":[["A",1,2]]}`: serde_json
    // calls an over-long array "trailing characters", a syntax error.
    #[test]
    fn well_formed_json_is_refused_as_invalid_never_as_malformed(body in prop_oneof![json(), body_like(), over_long_line()]) {
        if let Err(e) = parse_value(&body) {
            prop_assert!(e.starts_with("invalid request"), "well-formed JSON refused as {}", e);
        }
    }

    // Fails today: serde's derived structs also accept arrays, so
    // `[[["A",1]]]` places an order; `deny_unknown_fields` does not cover it.
    #[test]
    fn a_body_in_array_form_is_refused(lines in valid_lines(1..4), shipping in valid_shipping(), form in 0..3) {
        let line_arrays: Vec<Value> = lines.iter().map(|(sku, q)| json!([sku, q])).collect();
        let line_objects: Vec<Value> = lines.iter().map(|(sku, q)| json!({ "sku": sku, "quantity": q })).collect();
        let body = match form {
            0 => json!([line_objects, shipping]),
            1 => json!({ "lines": line_arrays }),
            _ => {
                let s = shipping.unwrap_or_else(|| Shipping {
                    name: "Ana".into(), line1: "Rua 1".into(), city: "Recife".into(), postal_code: "50000".into(), country: "BR".into(),
                });
                json!({ "lines": line_objects, "shipping": [s.name, s.line1, s.city, s.postal_code, s.country] })
            }
        };
        let parsed = parse_value(&body);
        prop_assert!(parsed.is_err(), "accepted {}", body);
    }

    #[test]
    fn lines_are_accepted_exactly_when_within_the_documented_bounds(lines in prop::collection::vec((sku_text(), quantity()), 0..5)) {
        let distinct = lines.iter().enumerate().all(|(i, (sku, _))| lines[..i].iter().all(|(other, _)| other != sku));
        let expected = !lines.is_empty() && distinct && lines.iter().all(|(sku, q)| is_sku(sku) && (1..=MAX_LINE_QUANTITY).contains(q));
        let parsed = parse_value(&body(&lines, None));
        prop_assert_eq!(parsed.is_ok(), expected, "{:?}", parsed.map(|r| r.lines));
    }

    #[test]
    fn an_address_is_accepted_exactly_when_within_the_documented_bounds(
        lines in valid_lines(1..3),
        shipping in shipping(address_field(), country()),
    ) {
        let s = &shipping;
        let expected = [&s.name, &s.line1, &s.city, &s.postal_code].into_iter().all(|f| is_address_field(f)) && is_country(&s.country);
        let parsed = parse_value(&body(&lines, Some(s)));
        prop_assert_eq!(parsed.is_ok(), expected, "{:?}", parsed.map(|r| r.shipping));
    }

    #[test]
    fn an_order_of_1_to_100_lines_is_accepted_and_more_are_refused(lines in valid_lines(0..=MAX_LINES + 5)) {
        let parsed = parse_value(&body(&lines, None));
        prop_assert_eq!(parsed.is_ok(), (1..=MAX_LINES).contains(&lines.len()));
    }

    #[test]
    fn a_sku_on_two_lines_is_refused(lines in valid_lines(1..20), repeat in any::<prop::sample::Index>(), q in 1..=MAX_LINE_QUANTITY) {
        let mut lines = lines;
        let sku = repeat.get(&lines).0.clone();
        lines.push((sku, q));
        let parsed = parse_value(&body(&lines, None));
        prop_assert!(parsed.is_err());
    }

    #[test]
    fn a_valid_request_round_trips_through_the_parser(lines in valid_lines(1..=MAX_LINES), shipping in valid_shipping()) {
        let req = parse_value(&body(&lines, shipping.as_ref())).map_err(TestCaseError::fail)?;
        let back: Vec<(String, i64)> = req.lines.iter().map(|(sku, q)| (sku.as_str().to_owned(), q.get())).collect();
        prop_assert_eq!(back, lines);
        prop_assert_eq!(req.shipping, shipping);
    }

    #[test]
    fn the_fingerprint_ignores_layout_and_key_order_but_not_content(
        lines in valid_lines(1..10),
        shipping in valid_shipping(),
        bump in any::<prop::sample::Index>(),
    ) {
        let value = body(&lines, shipping.as_ref());
        let compact = parse_value(&value).map_err(TestCaseError::fail)?.fingerprint;
        let pretty = serde_json::to_vec_pretty(&value).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(parse(&Bytes::from(pretty)).map_err(|e| TestCaseError::fail(e.to_string()))?.fingerprint, compact);
        // Keys reversed, and an explicit `"shipping": null` for an absent address.
        let reversed: Vec<String> = lines.iter().map(|(sku, q)| format!(r#"{{"quantity":{q},"sku":{}}}"#, json!(sku))).collect();
        let text = format!(r#"{{"shipping":{},"lines":[{}]}}"#, json!(shipping), reversed.join(","));
        prop_assert_eq!(parse(&Bytes::from(text)).map_err(|e| TestCaseError::fail(e.to_string()))?.fingerprint, compact);
        let mut changed = lines.clone();
        let line = bump.get_mut(&mut changed);
        line.1 = line.1 % MAX_LINE_QUANTITY + 1;
        prop_assert_ne!(parse_value(&body(&changed, shipping.as_ref())).map_err(TestCaseError::fail)?.fingerprint, compact);
    }
}
