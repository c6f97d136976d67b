mod projections;
mod relay;
