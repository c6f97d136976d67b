mod flow;
mod money;
mod webhooks;
