//! W3C Trace Context `traceparent` values, parsed strictly: a header is
//! input like any other, so an invalid one is dropped and a new trace is
//! started — it is never stored or forwarded verbatim.

use std::fmt;

/// A valid `traceparent` (version 00): trace id, parent span id, flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    trace_id: [u8; 16],
    parent_id: [u8; 8],
    flags: u8,
}

impl TraceParent {
    /// Parses `00-<32 hex>-<16 hex>-<2 hex>` (lower-case hex, ids not all
    /// zero). A future version (not `ff`) is read by its first four fields,
    /// as the specification asks. Anything else is `None`.
    pub fn parse(text: &str) -> Option<TraceParent> {
        let text = text.trim();
        if text.len() > 512 {
            return None;
        }
        let mut parts = text.split('-');
        let version = parts.next()?;
        let (trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?);
        let rest = parts.next();
        let version = hex::<1>(version)?[0];
        if version == 0xff || (version == 0 && (rest.is_some() || text.len() != 55)) {
            return None;
        }
        let trace_id = hex::<16>(trace)?;
        let parent_id = hex::<8>(parent)?;
        let flags = hex::<1>(flags)?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// A new trace, sampled, with random ids.
    pub fn start() -> TraceParent {
        let mut trace_id: [u8; 16] = rand::random();
        let mut parent_id: [u8; 8] = rand::random();
        // All-zero ids are invalid; make that impossible rather than unlikely.
        trace_id[0] |= 1;
        parent_id[0] |= 1;
        TraceParent {
            trace_id,
            parent_id,
            flags: 1,
        }
    }

    /// The same trace, one hop on: a new parent (span) id, the same flags,
    /// as a caller sends it to the next service.
    pub fn child(&self) -> TraceParent {
        let mut parent_id: [u8; 8] = rand::random();
        parent_id[0] |= 1;
        TraceParent { parent_id, ..*self }
    }

    /// The header's value if it is valid, else a new trace.
    pub fn from_header(value: Option<&str>) -> TraceParent {
        value
            .and_then(TraceParent::parse)
            .unwrap_or_else(TraceParent::start)
    }

    /// The raw ids: trace id, parent (span) id, flags.
    pub fn ids(&self) -> ([u8; 16], [u8; 8], u8) {
        (self.trace_id, self.parent_id, self.flags)
    }

    /// The trace id as 32 hex digits.
    pub fn trace_id(&self) -> String {
        self.trace_id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for TraceParent {
    /// Always written back as version 00 in canonical form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        for b in self.trace_id {
            write!(f, "{b:02x}")?;
        }
        f.write_str("-")?;
        for b in self.parent_id {
            write!(f, "{b:02x}")?;
        }
        write!(f, "-{:02x}", self.flags)
    }
}

/// A W3C `tracestate` header's value in canonical form, if it is valid (at
/// most 512 characters and 32 list members, each `key=value` as the
/// specification allows); anything else is dropped, never forwarded.
pub fn tracestate(value: Option<&str>) -> Option<String> {
    let value = value?.trim();
    if value.is_empty() || value.len() > 512 {
        return None;
    }
    let members: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .collect();
    if members.is_empty() || members.len() > 32 {
        return None;
    }
    // Optional whitespace around list members is allowed; the parser wants none.
    let state: opentelemetry::trace::TraceState = members.join(",").parse().ok()?;
    Some(state.header()).filter(|h| !h.is_empty())
}

/// Exactly `N` bytes from `2N` lower-case hex digits.
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let bytes = text.as_bytes();
    if bytes.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::TraceParent;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_tracestate_is_kept_and_an_invalid_one_dropped() {
        assert_eq!(
            super::tracestate(Some("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE")),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE".to_owned())
        );
        assert_eq!(super::tracestate(Some("no equals sign")), None);
        assert_eq!(super::tracestate(Some(&"a=b,".repeat(200))), None);
        assert_eq!(super::tracestate(None), None);
    }

    #[test]
    fn a_valid_traceparent_round_trips() {
        let t = TraceParent::parse(VALID).expect("valid");
        assert_eq!(t.to_string(), VALID);
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn invalid_traceparents_are_refused() {
        let long = format!("00-{}-00f067aa0ba902b7-01", "a".repeat(200_000));
        for bad in [
            "",
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            long.as_str(),
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:.80}");
        }
    }

    #[test]
    fn a_future_version_is_read_by_its_known_fields_and_written_as_00() {
        let t = TraceParent::parse(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next",
        )
        .expect("future");
        assert_eq!(t.to_string(), VALID);
    }

    #[test]
    fn a_dropped_header_starts_a_new_valid_trace() {
        let t = TraceParent::from_header(Some("nonsense"));
        assert_eq!(TraceParent::parse(&t.to_string()), Some(t));
        assert_ne!(TraceParent::start(), TraceParent::start());
    }
}
