//! Test kit (in progress).
