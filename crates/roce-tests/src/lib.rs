//! roce-tests: harness (being written).
