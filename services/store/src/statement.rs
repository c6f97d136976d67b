//! The SQL builder of the write path: one statement of data-modifying
//! CTEs, each fragment with its own arguments and a check of what it
//! returned.

use crate::StoreError;
use domain::Sku;
use sqlx::postgres::PgArguments;
use sqlx::{Arguments, Postgres, Row};
use uuid::Uuid;

/// What a commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Written {
    Done,
    /// A stock movement lacked the units: the caller must roll back.
    StockShort(Sku),
}

/// One statement built of data-modifying CTEs, each a fragment with its
/// own arguments and a check of what it returned. PostgreSQL runs the
/// sub-statements a query reads as it reads them: the checks are read in
/// the order they were added, so each fragment's rows are written in that
/// order (the stock moves, added last, lock their rows last). All the
/// sub-statements see one snapshot: a fragment never reads what another
/// writes, and no two touch one row.
pub(crate) struct Statement<'q> {
    ctes: Vec<String>,
    checks: Vec<(String, Check)>,
    args: PgArguments,
    /// Unique keys a concurrent writer may have taken first, each with the
    /// id a violation of it names in `StoreError::Conflict`.
    taken: Vec<(&'static str, Uuid)>,
    _values: std::marker::PhantomData<&'q ()>,
}

/// What a fragment must return.
enum Check {
    /// Exactly this many rows, or another writer got there first.
    Rows { expected: i64, conflict: Uuid },
    /// Every one of these SKUs moved, or the first that did not lacked units.
    Moved(Vec<Sku>),
    /// Rows of any number, in order (for the ordering of the writes alone).
    Any,
    /// The text each row returned, handed back by [`Statement::run_returning`].
    Returned,
}

impl<'q> Statement<'q> {
    pub(crate) fn new() -> Self {
        Statement {
            ctes: vec![],
            checks: vec![],
            args: PgArguments::default(),
            taken: Vec::new(),
            _values: std::marker::PhantomData,
        }
    }

    /// Binds `value`; returns its placeholder (`$n`).
    pub(crate) fn bind<T>(&mut self, value: T) -> Result<String, StoreError>
    where
        T: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>,
    {
        self.args
            .add(value)
            .map_err(|e| StoreError::Corrupt(format!("encoding an argument: {e}")))?;
        Ok(format!("${}", self.args.len()))
    }

    /// Adds the sub-statement `name AS (sql)`; names are unique per statement.
    pub(crate) fn cte(&mut self, name: &str, sql: &str) {
        self.ctes.push(format!("{name} AS ({sql})"));
    }

    /// `name` (which returns a row per row it wrote) must write exactly
    /// `expected` rows; fewer is `StoreError::Conflict(conflict)`.
    pub(crate) fn expect_rows(&mut self, name: &str, expected: usize, conflict: Uuid) {
        self.checks.push((
            format!("(SELECT count(*) FROM {name})"),
            Check::Rows {
                expected: i64::try_from(expected).unwrap_or(i64::MAX),
                conflict,
            },
        ));
    }

    /// `name` (which returns the SKU of each row it moved) must move each of
    /// `skus` (in SKU order); the first it did not is `Written::StockShort`.
    pub(crate) fn expect_moved(&mut self, name: &str, skus: Vec<Sku>) {
        self.checks.push((
            format!("(SELECT coalesce(array_agg(sku), '{{}}') FROM {name})"),
            Check::Moved(skus),
        ));
    }

    /// `name` writes its rows at this point of the statement, however many.
    pub(crate) fn in_order(&mut self, name: &str) {
        self.checks
            .push((format!("(SELECT count(*) FROM {name})"), Check::Any));
    }

    /// `name` returns one text column; [`Statement::run_returning`] hands
    /// back what it returned at the index this returns.
    pub(crate) fn returning(&mut self, name: &str) -> usize {
        let index = self
            .checks
            .iter()
            .filter(|(_, c)| matches!(c, Check::Returned))
            .count();
        self.checks.push((
            format!("(SELECT coalesce(array_agg(r), '{{}}') FROM {name} AS t(r))"),
            Check::Returned,
        ));
        index
    }

    /// A row the statement inserts whose unique key `constraint` another
    /// writer took first (an event's version in its stream, a new order's
    /// id, an order's one shipment) is `StoreError::Conflict(id)`: the
    /// caller retries and finds that writer's row. The inserts carry no
    /// `ON CONFLICT` clause, whose speculative insertion writes one more
    /// WAL record per row.
    pub(crate) fn on_taken(&mut self, constraint: &'static str, id: Uuid) {
        self.taken.push((constraint, id));
    }

    /// The statement's text.
    fn sql(&self) -> String {
        let outputs: Vec<&str> = self.checks.iter().map(|(sql, _)| sql.as_str()).collect();
        let outputs = if outputs.is_empty() {
            "1".to_owned()
        } else {
            outputs.join(", ")
        };
        format!("WITH {} SELECT {outputs}", self.ctes.join(", "))
    }

    /// Runs the statement (none when nothing was added) and checks what
    /// each fragment returned.
    pub(crate) async fn run(self, conn: &mut sqlx::PgConnection) -> Result<Written, StoreError> {
        Ok(self.run_returning(conn).await?.0)
    }

    /// [`Statement::run`], with what each [`Statement::returning`] fragment
    /// returned, in the order they were added.
    pub(crate) async fn run_returning(
        self,
        conn: &mut sqlx::PgConnection,
    ) -> Result<(Written, Vec<Vec<String>>), StoreError> {
        let mut returned = vec![];
        if self.ctes.is_empty() {
            return Ok((Written::Done, returned));
        }
        let sql = self.sql();
        let row = match sqlx::query_with(&sql, self.args)
            .fetch_one(&mut *conn)
            .await
        {
            Err(e) => {
                let violated = crate::violated_constraint(&e);
                match self.taken.iter().find(|(c, _)| Some(*c) == violated) {
                    Some((_, id)) => return Err(StoreError::Conflict(*id)),
                    None => return Err(e.into()),
                }
            }
            Ok(row) => row,
        };
        let mut short = None;
        for (i, (_, check)) in self.checks.iter().enumerate() {
            match check {
                Check::Rows { expected, conflict } => {
                    if row.try_get::<i64, _>(i)? != *expected {
                        return Err(StoreError::Conflict(*conflict));
                    }
                }
                Check::Moved(skus) => {
                    let moved: Vec<String> = row.try_get(i)?;
                    let lacking = skus.iter().find(|k| !moved.iter().any(|m| m == k.as_str()));
                    short = short.or_else(|| lacking.cloned());
                }
                Check::Any => {}
                Check::Returned => returned.push(row.try_get(i)?),
            }
        }
        let written = match short {
            None => Written::Done,
            Some(sku) => Written::StockShort(sku),
        };
        Ok((written, returned))
    }
}
