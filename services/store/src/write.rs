//! The one write path. Whatever changes aggregates — placing, every order
//! transition, expiry, shipments, stock receipts — gathers its changes in a
//! [`Changes`] and commits them with [`commit`]: events with their outbox
//! rows, order and shipment projections, stock movements with their ledger
//! rows, all in **one statement** of data-modifying CTEs (one round trip
//! per batch, whatever it holds: on a saturated database each statement
//! costs its fixed parse, plan and executor start again). Each kind of row
//! is a [`Statement`] fragment written beside its table's module; the hot
//! stock rows are moved last within the statement, so they stay locked for
//! as short a time as possible.

use crate::journal::{self, Record};
use crate::statement::{Statement, Written};
use crate::stock::{self, Move};
use crate::StoreError;
use domain::shipment::{Shipment, ShipmentEvent};
use domain::{Event, Movement, Order, Sku};
use events::Metadata;
use std::collections::HashMap;
use uuid::Uuid;

/// Changes to commit together.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    records: Vec<Record>,
    /// Orders to insert, with their lines.
    placed: Vec<Order>,
    placed_at: HashMap<Uuid, usize>,
    /// Orders to update: (version before, after).
    updated: Vec<(i32, Order)>,
    updated_at: HashMap<Uuid, usize>,
    /// Shipments to insert.
    created: Vec<Shipment>,
    /// Shipments to update: (version before, after).
    advanced: Vec<(i32, Shipment)>,
    moves: Vec<Move>,
}

impl Changes {
    pub(crate) fn new() -> Self {
        Changes::default()
    }

    /// Records `events` on `before` (`None`: a new order): the events, the
    /// stock movements they cause, the projection. Returns the order after.
    pub(crate) fn order(
        &mut self,
        before: Option<&Order>,
        events: &[Event],
        meta: &Metadata,
    ) -> Result<Order, StoreError> {
        let mut next = before.cloned();
        for event in events {
            next = domain::evolve(next, event);
            let order = next
                .as_ref()
                .ok_or_else(|| StoreError::Corrupt(format!("{} on no order", event.type_name())))?;
            self.records
                .push(Record::order(order.id, order.version, event, meta));
            if let Some(movement) = event.movement() {
                self.lines(order, movement);
            }
        }
        let after = next.ok_or_else(|| StoreError::Corrupt("no events for a new order".into()))?;
        match before {
            None => {
                self.placed_at.insert(after.id, self.placed.len());
                self.placed.push(after.clone());
            }
            // A change of an order placed in this same batch: it is inserted as it ends up
            // (one statement cannot update a row it inserts).
            Some(_) if self.placed_at.contains_key(&after.id) => {
                self.placed[self.placed_at[&after.id]] = after.clone();
            }
            Some(b) => match self.updated_at.get(&after.id) {
                // A second change of the same order in one batch: one update, fenced on the first version.
                Some(&i) => self.updated[i].1 = after.clone(),
                None => {
                    self.updated_at.insert(after.id, self.updated.len());
                    self.updated.push((b.version, after.clone()));
                }
            },
        }
        Ok(after)
    }

    fn lines(&mut self, order: &Order, movement: Movement) {
        for line in &order.lines {
            self.moves.push(Move {
                sku: line.sku.clone(),
                movement,
                units: line.quantity.get(),
                order_id: Some(order.id),
                reason: None,
            });
        }
    }

    /// Records shipment `events` on `before` (`None`: a new shipment).
    pub(crate) fn shipment(
        &mut self,
        before: Option<&Shipment>,
        events: &[ShipmentEvent],
        meta: &Metadata,
    ) -> Result<Option<Shipment>, StoreError> {
        let mut next = before.cloned();
        for event in events {
            let s = domain::shipment::evolve(next, event);
            self.records.push(Record::shipment(event, s.version, meta)?);
            next = Some(s);
        }
        if let Some(after) = &next {
            match before {
                None => self.created.push(after.clone()),
                Some(b) if !events.is_empty() => self.advanced.push((b.version, after.clone())),
                Some(_) => {}
            }
        }
        Ok(next)
    }

    /// A movement not caused by an order event (receipts, adjustments).
    pub(crate) fn stock(
        &mut self,
        sku: &Sku,
        movement: Movement,
        units: i64,
        reason: Option<&str>,
    ) {
        self.moves.push(Move {
            sku: sku.clone(),
            movement,
            units,
            order_id: None,
            reason: reason.map(str::to_owned),
        });
    }
}

/// Writes `changes` in the caller's transaction, in one statement.
pub(crate) async fn commit(
    conn: &mut sqlx::PgConnection,
    changes: &Changes,
) -> Result<Written, StoreError> {
    let mut statement = Statement::new();
    changes.add_to(&mut statement)?;
    statement.run(conn).await
}

impl Changes {
    /// Adds every change to `statement`, as its fragments: shipments, events
    /// with their outbox rows, order projections, and last the stock moves,
    /// so the hot rows are locked by the statement's last sub-statement.
    pub(crate) fn add_to<'q>(&'q self, statement: &mut Statement<'q>) -> Result<(), StoreError> {
        crate::shipments::projection::insert(statement, &self.created)?;
        crate::shipments::projection::update(statement, &self.advanced)?;
        journal::append(statement, &self.records)?;
        crate::orders::projection::insert_projections_into(statement, &self.placed)?;
        crate::orders::projection::update_projections(statement, &self.updated)?;
        stock::apply(statement, &self.moves)
    }
}
