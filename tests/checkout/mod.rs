mod bad_input;
mod flash_sale;
mod idempotency;
mod orders;
mod limits;
