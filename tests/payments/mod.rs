mod audit;
mod flow;
mod free;
mod money;
mod webhooks;
