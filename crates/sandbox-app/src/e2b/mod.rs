pub mod deadlines;
pub mod expiry;
