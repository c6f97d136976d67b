mod consumer;
mod poison;
mod projections;
mod relay;
