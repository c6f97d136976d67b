//! The arithmetic the benchmark reports share: medians of rounds and
//! ratios that say nothing rather than divide by zero.

/// The median of `values` (the mean of the middle two for an even count);
/// `None` when there are none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

/// `after / before`, when `before` is a number other than zero.
pub fn ratio(after: f64, before: f64) -> Option<f64> {
    (before != 0.0 && before.is_finite() && after.is_finite()).then(|| after / before)
}

/// A number for a Markdown table: two decimals under 10, one under 100,
/// none above, thousands separated.
pub fn figure(value: f64) -> String {
    if !value.is_finite() {
        return "-".to_owned();
    }
    if value.abs() >= 100.0 {
        thousands(value.round() as i64)
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|g| std::str::from_utf8(g).unwrap_or_default())
        .collect();
    let out = groups.join(",");
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn figures_read_as_people_write_them() {
        assert_eq!(figure(1234.4), "1,234");
        assert_eq!(figure(12.34), "12.3");
        assert_eq!(figure(0.456), "0.46");
        assert_eq!(thousands(-1_000), "-1,000");
        assert_eq!(ratio(1.0, 0.0), None);
    }
}
