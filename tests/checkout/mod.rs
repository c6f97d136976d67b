mod bad_input;
mod coalesce;
mod connections;
mod flash_sale;
mod idempotency;
mod isolation;
mod limits;
mod orders;
