mod consumer;
mod projections;
mod relay;
