mod consumer;
mod poison;
mod power_loss;
mod projections;
mod relay;
