pub mod deadlines;
