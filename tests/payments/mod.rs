mod flow;
mod webhooks;
