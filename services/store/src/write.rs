//! The one write path. Whatever changes aggregates — placing, every order
//! transition, expiry, shipments, stock receipts — gathers its changes in a
//! [`Changes`] and commits them with [`commit`]: events with their outbox
//! rows, order and shipment projections, stock movements with their ledger
//! rows, each kind in one set-based statement (a fixed number of round trips
//! per batch, not per row). The hot stock rows are written last, so they
//! stay locked for as short a time as possible.

use crate::journal::{self, Record};
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
    /// Orders to update: (version before, after).
    updated: Vec<(i32, Order)>,
    updated_at: HashMap<Uuid, usize>,
    /// Shipments to insert.
    created: Vec<Shipment>,
    /// Shipments to update: (version before, after).
    advanced: Vec<(i32, Shipment)>,
    moves: Vec<Move>,
}

/// What a commit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Written {
    Done,
    /// A stock movement lacked the units: the caller must roll back.
    StockShort(Sku),
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
            None => self.placed.push(after.clone()),
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

/// Writes `changes` in the caller's transaction.
pub(crate) async fn commit(
    conn: &mut sqlx::PgConnection,
    changes: &Changes,
) -> Result<Written, StoreError> {
    crate::shipments::insert(conn, &changes.created).await?;
    crate::shipments::update(conn, &changes.advanced).await?;
    journal::append(conn, &changes.records).await?;
    crate::orders::insert_projections(conn, &changes.placed).await?;
    crate::orders::update_projections(conn, &changes.updated).await?;
    Ok(match stock::apply(conn, &changes.moves).await? {
        None => Written::Done,
        Some(sku) => Written::StockShort(sku),
    })
}
