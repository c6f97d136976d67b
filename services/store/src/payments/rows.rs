//! New `payments` rows: each payment's disposition recorded, one row each,
//! inserted as the first fragment of the write path's statement.

use super::fact::{PaymentFact, Source};
use crate::statement::Statement;
use crate::StoreError;
use domain::RefundReason;
use std::collections::HashSet;
use uuid::Uuid;

pub(super) enum Disposition {
    Attached,
    /// Refunded, or voided (`true`) when only authorized.
    Refund(RefundReason, bool),
}

/// Payments to record, one row each, inserted in one statement.
#[derive(Default)]
pub(super) struct NewPayments<'a> {
    ids: Vec<&'a str>,
    orders: Vec<Option<Uuid>>,
    amounts: Vec<i64>,
    currencies: Vec<&'a str>,
    dispositions: Vec<&'static str>,
    reasons: Vec<Option<&'static str>>,
    sources: Vec<&'static str>,
    methods: Vec<&'static str>,
}

impl<'a> NewPayments<'a> {
    pub(super) fn push(
        &mut self,
        fact: &'a PaymentFact,
        order_id: Option<Uuid>,
        disposition: Disposition,
        source: Source,
    ) {
        let (disposition, reason, method) = match disposition {
            Disposition::Attached => ("attached", None, "refund"),
            Disposition::Refund(reason, void) => (
                "refund",
                Some(reason.as_str()),
                if void { "void" } else { "refund" },
            ),
        };
        self.ids.push(&fact.payment_id);
        self.orders.push(order_id);
        self.amounts.push(fact.amount_minor);
        self.currencies.push(&fact.currency);
        self.dispositions.push(disposition);
        self.reasons.push(reason);
        self.sources.push(source.as_str());
        self.methods.push(method);
    }

    /// Inserts the rows, as the first fragment of `statement`; returns the
    /// index of what it returns ([`Statement::returning`]), `None` when there
    /// is nothing to insert.
    pub(super) fn insert_into<'q>(
        &'q self,
        statement: &mut Statement<'q>,
    ) -> Result<Option<usize>, StoreError> {
        if self.ids.is_empty() {
            return Ok(None);
        }
        let s = statement;
        let (ids, orders, amounts) = (
            s.bind(&self.ids)?,
            s.bind(&self.orders)?,
            s.bind(&self.amounts)?,
        );
        let (currencies, dispositions) = (s.bind(&self.currencies)?, s.bind(&self.dispositions)?);
        let (reasons, sources) = (s.bind(&self.reasons)?, s.bind(&self.sources)?);
        let methods = s.bind(&self.methods)?;
        s.cte(
            "recorded",
            &format!(
                "INSERT INTO payments (payment_id, order_id, amount_minor, currency, disposition, reason, learned_from, refund_state, next_attempt_at, refund_method) \
                 SELECT p, o, a, c, d, r, s, CASE WHEN d = 'refund' THEN 'pending' END, CASE WHEN d = 'refund' THEN now() END, m \
                 FROM unnest({ids}::text[], {orders}::uuid[], {amounts}::bigint[], {currencies}::text[], {dispositions}::text[], {reasons}::text[], {sources}::text[], {methods}::text[]) AS t(p, o, a, c, d, r, s, m) \
                 ON CONFLICT DO NOTHING RETURNING payment_id"
            ),
        );
        Ok(Some(s.returning("recorded")))
    }

    /// The payment ids another decider recorded first: those the insert did not return.
    pub(super) fn lost(&self, inserted: Option<&Vec<String>>) -> HashSet<&'a str> {
        let inserted: HashSet<&str> = inserted
            .map(|ids| ids.iter().map(String::as_str).collect())
            .unwrap_or_default();
        self.ids
            .iter()
            .copied()
            .filter(|id| !inserted.contains(id))
            .collect()
    }
}
