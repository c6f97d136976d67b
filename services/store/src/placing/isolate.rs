//! Step 4 of a placing group: writing its keys and accepted orders in one
//! statement and, when that statement fails for one placement's sake,
//! finding which placements fail without failing the rest. The search is a
//! bisection under savepoints, in the group's own transaction: a half that
//! writes cleanly holds no culprit, a failing half is split again, a
//! failing single placement is a culprit. Every trial is rolled back to its
//! savepoint; the caller then decides the group again without the culprits
//! (their units go back to the others) and writes it in one statement, so
//! the rest still commits together, once.

use super::{GroupReport, Placement};
use crate::idempotency::StoredResponse;
use crate::statement::{Statement, Written};
use crate::write::Changes;
use crate::StoreError;
use sqlx::PgConnection;

/// One placement's part of the statement: its key with the accepted order
/// (`refused: None`), or its key with the refusal stored under it.
pub(super) struct Write {
    pub at: usize,
    pub refused: Option<StoredResponse>,
}

/// Writes `writes` (keys, then the accepted orders on the write path, stock
/// last) in one statement.
pub(super) async fn write(
    conn: &mut PgConnection,
    group: &[Placement<'_>],
    writes: &[Write],
) -> Result<Written, StoreError> {
    let mut changes = Changes::new();
    let mut keys = super::keys::StoredKeys::default();
    for w in writes {
        let p = &group[w.at];
        match &w.refused {
            None => {
                changes.order(None, &p.events, &p.meta)?;
                keys.push(&p.key, &p.accepted);
            }
            Some(refused) => keys.push(&p.key, refused),
        }
    }
    let mut statement = Statement::new();
    keys.insert_into(&mut statement)?;
    changes.add_to(&mut statement)?;
    statement.run(conn).await
}

/// Whether an error is the database's verdict on the statement's rows (a
/// constraint, a trigger, a value it cannot store), not on the connection
/// or the transaction as a whole: only such a failure can belong to one
/// placement.
fn is_per_row(e: &StoreError) -> bool {
    !e.is_unavailable() && !e.is_transient()
}

/// [`write`] under a savepoint: `Ok(Err(culprits))` when it failed for
/// some placements' sake — each found alone, with its error; the
/// statement's effects are rolled back and the caller decides again
/// without them. `Err` when it failed for every placement (an unavailable
/// database, a deadlock) or no single placement could be blamed.
pub(super) async fn write_or_find(
    conn: &mut PgConnection,
    group: &[Placement<'_>],
    writes: &[Write],
    report: &mut GroupReport,
) -> Result<Result<Written, Vec<(usize, StoreError)>>, StoreError> {
    let first = match trial(conn, group, writes, false).await? {
        Ok(written) => return Ok(Ok(written)),
        Err(e) => e,
    };
    report.probes += 1;
    let mut culprits = Vec::new();
    let mut pending: Vec<&[Write]> = halves(writes).into_iter().collect();
    while let Some(part) = pending.pop() {
        report.probes += 1;
        match trial(conn, group, part, true).await? {
            Ok(_) => {}
            Err(e) if part.len() == 1 => culprits.push((part[0].at, e)),
            Err(_) => pending.extend(halves(part)),
        }
    }
    if culprits.is_empty() {
        // The group fails, yet every part of it writes: a conflict between
        // placements, which only running them apart can settle.
        return Err(first);
    }
    for (at, e) in &culprits {
        tracing::warn!(error = %e, at, "a placement fails in the database: it fails alone");
    }
    Ok(Err(culprits))
}

/// The two halves of `writes` (one when it is a single write).
fn halves(writes: &[Write]) -> Vec<&[Write]> {
    if writes.len() < 2 {
        return vec![writes];
    }
    let (a, b) = writes.split_at(writes.len() / 2);
    vec![a, b]
}

/// Runs [`write`] under a savepoint, rolled back when it failed for its
/// rows (`Ok(Err(e))`) and, for a probe, always. `Err` for a failure of the
/// whole transaction.
async fn trial(
    conn: &mut PgConnection,
    group: &[Placement<'_>],
    writes: &[Write],
    probe: bool,
) -> Result<Result<Written, StoreError>, StoreError> {
    run(conn, "SAVEPOINT one_placement").await?;
    let written = write(conn, group, writes).await;
    match written {
        Err(e) if !is_per_row(&e) => Err(e),
        Ok(w) if !probe => {
            run(conn, "RELEASE SAVEPOINT one_placement").await?;
            Ok(Ok(w))
        }
        other => {
            run(conn, "ROLLBACK TO SAVEPOINT one_placement").await?;
            run(conn, "RELEASE SAVEPOINT one_placement").await?;
            Ok(other)
        }
    }
}

/// Runs one savepoint command.
async fn run(conn: &mut PgConnection, sql: &'static str) -> Result<(), StoreError> {
    sqlx::query(sql).execute(&mut *conn).await?;
    Ok(())
}
