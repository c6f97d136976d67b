//! Products and the stock operations operators perform: receive, adjust,
//! show. Buckets change only with a ledger row beside them.

use crate::statement::Written;
use crate::write::{self, Changes};
use crate::StoreError;
use domain::{Currency, Movement, Sku};
use serde::Serialize;
use sqlx::{PgPool, Postgres, Transaction};
use std::collections::HashMap;

/// A product's catalogue price and its flash-sale limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Price {
    pub minor: i64,
    pub currency: Currency,
    /// Units one order may ask for.
    pub max_per_order: Option<i64>,
    /// Units one account may hold in pending or confirmed orders, ever.
    pub per_account_limit: Option<i64>,
    /// Whether it is on sale (checkout refuses a deactivated SKU).
    pub active: bool,
}

/// A product as the catalogue holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Product {
    pub sku: String,
    pub name: String,
    pub price_minor: i64,
    pub currency: String,
    pub active: bool,
    pub max_per_order: Option<i64>,
    pub per_account_limit: Option<i64>,
}

/// What `product update` changes; `None` keeps the current value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProductChange {
    pub name: Option<String>,
    pub price_minor: Option<i64>,
    /// Only together with `price_minor`: an amount means nothing in another currency.
    pub currency: Option<Currency>,
}

/// One SKU's three buckets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct StockRow {
    pub sku: String,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

/// Why an operator's stock command was refused.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("product {0} already exists")]
    DuplicateSku(String),
    #[error("unknown sku {0}")]
    UnknownSku(String),
    #[error("available stock of {sku} would go below zero ({available} available, delta {delta})")]
    BelowZero {
        sku: String,
        available: i64,
        delta: i64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CatalogError {
    fn from(e: sqlx::Error) -> Self {
        CatalogError::Store(e.into())
    }
}

/// Adds a product with empty stock buckets.
pub async fn add_product(
    pool: &PgPool,
    sku: &Sku,
    name: &str,
    price_minor: i64,
    currency: Currency,
) -> Result<(), CatalogError> {
    let mut tx = pool.begin().await?;
    let inserted = sqlx::query(
        "INSERT INTO products (sku, name, price_minor, currency) VALUES ($1, $2, $3, $4)",
    )
    .bind(sku.as_str())
    .bind(name)
    .bind(price_minor)
    .bind(currency.as_str())
    .execute(&mut *tx)
    .await;
    if let Err(e) = &inserted {
        if crate::violated_constraint(e) == Some("products_pkey") {
            return Err(CatalogError::DuplicateSku(sku.to_string()));
        }
    }
    inserted?;
    sqlx::query("INSERT INTO stock (sku) VALUES ($1)")
        .bind(sku.as_str())
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Catalogue prices of the SKUs that exist among `skus`.
pub async fn prices(pool: &PgPool, skus: &[&str]) -> Result<HashMap<String, Price>, StoreError> {
    type Row = (String, i64, String, Option<i64>, Option<i64>, bool);
    let rows: Vec<Row> =
        sqlx::query_as("SELECT sku, price_minor, currency, max_per_order, per_account_limit, active FROM products WHERE sku = ANY($1)")
            .bind(skus)
            .fetch_all(pool)
            .await?;
    rows.into_iter()
        .map(
            |(sku, minor, currency, max_per_order, per_account_limit, active)| {
                let currency = currency
                    .parse()
                    .map_err(|_| StoreError::Corrupt(format!("currency of {sku}")))?;
                Ok((
                    sku,
                    Price {
                        minor,
                        currency,
                        max_per_order,
                        per_account_limit,
                        active,
                    },
                ))
            },
        )
        .collect()
}

/// Sets (or, with `None`, clears) a SKU's flash-sale limits; `false` if there is no such product.
pub async fn set_limits(
    pool: &PgPool,
    sku: &Sku,
    max_per_order: Option<i64>,
    per_account_limit: Option<i64>,
) -> Result<bool, StoreError> {
    let updated = sqlx::query(
        "UPDATE products SET max_per_order = $2, per_account_limit = $3 WHERE sku = $1",
    )
    .bind(sku.as_str())
    .bind(max_per_order)
    .bind(per_account_limit)
    .execute(pool)
    .await?;
    Ok(updated.rows_affected() == 1)
}

const PRODUCT: &str = "sku, name, price_minor, currency, active, max_per_order, per_account_limit";

/// Every product (or the one SKU), in SKU order.
pub async fn products(pool: &PgPool, sku: Option<&Sku>) -> Result<Vec<Product>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {PRODUCT} FROM products WHERE $1::text IS NULL OR sku = $1 ORDER BY sku"
    ))
    .bind(sku.map(Sku::as_str))
    .fetch_all(pool)
    .await?)
}

/// Changes a product's name and price (with its currency) for orders
/// placed from now on; an order already placed keeps the unit prices and
/// currency it was placed at (its lines hold them). `None` if there is no
/// such product.
pub async fn update_product(
    pool: &PgPool,
    sku: &Sku,
    change: &ProductChange,
) -> Result<Option<Product>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "UPDATE products SET name = coalesce($2, name), price_minor = coalesce($3, price_minor), \
                currency = coalesce($4, currency) WHERE sku = $1 RETURNING {PRODUCT}"
    ))
    .bind(sku.as_str())
    .bind(change.name.as_deref())
    .bind(change.price_minor)
    .bind(change.currency.map(|c| c.as_str().to_owned()))
    .fetch_optional(pool)
    .await?)
}

/// Puts a product on sale or takes it off: the product, and whether this
/// changed it (`None` if there is no such product). Checkout reads the
/// catalogue for every placement group, without a cache, so the change
/// holds for every placement priced after it commits.
pub async fn set_active(
    pool: &PgPool,
    sku: &Sku,
    active: bool,
) -> Result<Option<(Product, bool)>, StoreError> {
    let changed: Option<Product> = sqlx::query_as(&format!(
        "UPDATE products SET active = $2 WHERE sku = $1 AND active <> $2 RETURNING {PRODUCT}"
    ))
    .bind(sku.as_str())
    .bind(active)
    .fetch_optional(pool)
    .await?;
    if let Some(product) = changed {
        return Ok(Some((product, true)));
    }
    Ok(products(pool, Some(sku))
        .await?
        .into_iter()
        .next()
        .map(|p| (p, false)))
}

/// Goods in: `quantity` more units available, with a `receive` ledger row.
pub async fn receive(pool: &PgPool, sku: &Sku, quantity: i64) -> Result<StockRow, CatalogError> {
    move_available(pool, sku, quantity, Movement::Receive, None).await
}

/// A signed correction of `available` (shrinkage, recount) with its reason.
pub async fn adjust(
    pool: &PgPool,
    sku: &Sku,
    delta: i64,
    reason: &str,
) -> Result<StockRow, CatalogError> {
    move_available(pool, sku, delta, Movement::Adjust, Some(reason)).await
}

async fn move_available(
    pool: &PgPool,
    sku: &Sku,
    delta: i64,
    movement: Movement,
    reason: Option<&str>,
) -> Result<StockRow, CatalogError> {
    let mut tx: Transaction<'_, Postgres> = pool.begin().await?;
    let mut changes = Changes::new();
    changes.stock(sku, movement, delta, reason);
    if let Written::StockShort(_) = write::commit(&mut tx, &changes).await? {
        tx.rollback().await?;
        let current = show(pool, Some(sku)).await?;
        return Err(match current.first() {
            Some(s) => CatalogError::BelowZero {
                sku: sku.to_string(),
                available: s.available,
                delta,
            },
            None => CatalogError::UnknownSku(sku.to_string()),
        });
    }
    let row: StockRow =
        sqlx::query_as("SELECT sku, available, reserved, sold FROM stock_buckets WHERE sku = $1")
            .bind(sku.as_str())
            .fetch_one(&mut *tx)
            .await?;
    tx.commit().await?;
    Ok(row)
}

/// The buckets of one SKU, or of all SKUs in SKU order.
pub async fn show(pool: &PgPool, sku: Option<&Sku>) -> Result<Vec<StockRow>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT sku, available, reserved, sold FROM stock_buckets WHERE $1::text IS NULL OR sku = $1 ORDER BY sku",
    )
    .bind(sku.map(Sku::as_str))
    .fetch_all(pool)
    .await?)
}
