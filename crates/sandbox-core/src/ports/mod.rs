//! The ports (traits) adapters implement and the application layer consumes.

pub mod deadlines;
pub mod provider;
pub mod session;
pub mod store;
