//! envd wire types and the Connect envelope codec, without I/O.
//!
//! Not built yet: see this crate's README for what will live here. The crate exists now so the
//! dependency lines of the workspace are real and checked by `cargo xtask tidy`.
