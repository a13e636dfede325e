//! Harness for the Soft-RoCE interoperability suite (`tests/softroce.rs`).
#![warn(missing_docs)]
