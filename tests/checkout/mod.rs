mod bad_input;
mod flash_sale;
mod idempotency;
mod limits;
mod orders;
