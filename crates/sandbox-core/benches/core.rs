//! Placeholder until the bench suite lands in this commit series.
fn main() {}
