mod audit;
mod batch;
mod flow;
mod free;
mod keepalive;
mod money;
mod webhooks;
