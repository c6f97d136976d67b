//! Paged listings in creation order. A [`Position`] marks where a page ended; the next page
//! starts just after it, so a client paging through sees every item exactly once, including
//! items created meanwhile (they are always created after every existing one).

use std::collections::BTreeSet;
use std::ops::Bound;

use chrono::{DateTime, Utc};

/// A place in the creation order: an item's creation time and id (which breaks ties).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// The item's `created_at`.
    pub created_at: DateTime<Utc>,
    /// The item's id.
    pub id: String,
}

/// Which page to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    /// Only items created at or after this time.
    pub created_gte: Option<DateTime<Utc>>,
    /// Only items after this position (where the previous page ended).
    pub after: Option<Position>,
    /// At most this many items.
    pub limit: usize,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    /// The items, oldest first.
    pub items: Vec<T>,
    /// Whether more items follow this page (at the time it was read).
    pub has_more: bool,
    /// Where this page ended; `None` when it is empty.
    pub last: Option<Position>,
}

/// Reads one page from an index in creation order, looking each item up by id.
pub(super) fn page<T>(
    index: &BTreeSet<Position>,
    request: &PageRequest,
    item: impl Fn(&str) -> Option<T>,
) -> Page<T> {
    // The empty id sorts before every real one, so this bound includes the whole instant.
    let from = request.created_gte.map(|created_at| Position {
        created_at,
        id: String::new(),
    });
    let lower = match (&request.after, from) {
        (Some(after), Some(from)) if from > *after => Bound::Included(from),
        (Some(after), _) => Bound::Excluded(after.clone()),
        (None, Some(from)) => Bound::Included(from),
        (None, None) => Bound::Unbounded,
    };
    let mut positions = index.range((lower, Bound::Unbounded));
    let taken: Vec<&Position> = positions.by_ref().take(request.limit).collect();
    let has_more = positions.next().is_some();
    Page {
        items: taken
            .iter()
            .filter_map(|position| item(&position.id))
            .collect(),
        has_more,
        last: taken.last().map(|position| (*position).clone()),
    }
}
