mod audit;
mod batch;
mod flow;
mod free;
mod money;
mod webhooks;
