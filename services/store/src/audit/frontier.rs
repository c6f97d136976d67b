//! How far an audit has read an append-only table whose rows take numbers
//! from a sequence (`events.position`, `stock_ledger.id`): the highest
//! number its snapshot held, and the numbers below it the snapshot did not
//! hold. A number is taken when a row is inserted, not when it commits, so a
//! transaction still in flight leaves a hole that fills later; a rolled-back
//! one leaves a hole for ever. The next audit reads the rows past `upto` and
//! the holes; a hole not filled within the patience is taken for a rollback
//! and forgotten (a full pass checks everything again).

use chrono::{DateTime, Utc};
use std::time::Duration;

/// Read up to `upto`, except the holes (each with when it was first seen).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Frontier {
    pub upto: i64,
    pub holes: Vec<(i64, DateTime<Utc>)>,
}

impl Frontier {
    /// The frontier after reading `seen` (every number the snapshot holds
    /// past `upto` or in a hole, in any order), at `now`; holes older than
    /// `patience` are dropped.
    pub fn advance(&self, seen: &mut [i64], now: DateTime<Utc>, patience: Duration) -> Frontier {
        seen.sort_unstable();
        let filled = |n: i64| seen.binary_search(&n).is_ok();
        let patience = chrono::Duration::from_std(patience).unwrap_or(chrono::Duration::MAX);
        let mut holes: Vec<(i64, DateTime<Utc>)> = self
            .holes
            .iter()
            .filter(|(n, at)| !filled(*n) && now - *at <= patience)
            .copied()
            .collect();
        let mut next = self.upto + 1;
        for &n in seen.iter().filter(|n| **n > self.upto) {
            holes.extend((next..n).map(|h| (h, now)));
            next = next.max(n + 1);
        }
        Frontier {
            upto: next - 1,
            holes,
        }
    }

    /// The frontier of a full read: everything up to the highest number
    /// `seen`, with holes only among the numbers past `recent_from` (older
    /// holes are rollbacks).
    pub fn of_full_read(
        max: i64,
        recent: &mut [i64],
        recent_from: i64,
        now: DateTime<Utc>,
    ) -> Frontier {
        Frontier {
            upto: recent_from,
            holes: vec![],
        }
        .advance(recent, now, Duration::MAX)
        .with_upto(max)
    }

    fn with_upto(mut self, max: i64) -> Frontier {
        self.upto = self.upto.max(max);
        self
    }

    pub fn hole_numbers(&self) -> Vec<i64> {
        self.holes.iter().map(|h| h.0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).expect("a time")
    }

    #[test]
    fn rows_past_the_frontier_move_it_and_leave_holes_for_what_is_missing() {
        let f = Frontier::default().advance(&mut [3, 1, 5], at(0), Duration::from_secs(60));
        assert_eq!(f.upto, 5);
        assert_eq!(f.hole_numbers(), vec![2, 4]);
    }

    #[test]
    fn a_hole_that_fills_is_read_once_and_a_stale_one_is_forgotten() {
        let f = Frontier {
            upto: 5,
            holes: vec![(2, at(0)), (4, at(50))],
        };
        let next = f.advance(&mut [2, 6], at(100), Duration::from_secs(60));
        assert_eq!(next.upto, 6);
        assert_eq!(next.hole_numbers(), vec![4]);
        let later = next.advance(&mut [], at(111), Duration::from_secs(60));
        assert!(
            later.holes.is_empty(),
            "the hole seen at 50 is a rollback by 111"
        );
        assert_eq!(later.upto, 6);
    }

    #[test]
    fn nothing_new_keeps_the_frontier() {
        let f = Frontier {
            upto: 9,
            holes: vec![(7, at(0))],
        };
        assert_eq!(f.advance(&mut [], at(1), Duration::from_secs(60)), f);
    }

    #[test]
    fn a_full_read_keeps_only_recent_holes() {
        let f = Frontier::of_full_read(10, &mut [8, 10], 6, at(0));
        assert_eq!(f.upto, 10);
        assert_eq!(f.hole_numbers(), vec![7, 9]);
        let empty = Frontier::of_full_read(10, &mut [], 10, at(0));
        assert_eq!((empty.upto, empty.holes.len()), (10, 0));
    }
}
