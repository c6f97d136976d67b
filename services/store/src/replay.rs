//! What `soldonce replay` needs of the database beyond the projections
//! module: a scratch schema holding empty copies of the orders projection,
//! to fold a stream into and compare with the live tables.

use crate::StoreError;
use sqlx::PgConnection;
use uuid::Uuid;

/// Creates a scratch schema with empty copies of `orders` and `order_lines`
/// and points the transaction's search path at it, so
/// [`crate::projections::write`] and [`crate::projections::snapshot`] use
/// the copies until the transaction ends; returns the schema's name. Call it
/// inside a transaction: rolling back drops the schema, committing keeps it.
pub async fn enter_scratch(conn: &mut PgConnection) -> Result<String, StoreError> {
    let scratch = format!("replay_{}", Uuid::new_v4().simple());
    for sql in [
        format!("CREATE SCHEMA {scratch}"),
        format!("CREATE TABLE {scratch}.orders (LIKE public.orders INCLUDING ALL)"),
        format!("CREATE TABLE {scratch}.order_lines (LIKE public.order_lines INCLUDING ALL)"),
        format!("SET LOCAL search_path = {scratch}"),
    ] {
        sqlx::query(&sql).execute(&mut *conn).await?;
    }
    Ok(scratch)
}
