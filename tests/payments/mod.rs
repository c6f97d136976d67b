mod flow;
mod money;
mod webhooks;
mod audit;
mod free;
