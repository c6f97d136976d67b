mod consumer;
mod poison;
mod power_loss;
mod projections;
mod redrive;
mod relay;
mod requeue;
mod schemas;
