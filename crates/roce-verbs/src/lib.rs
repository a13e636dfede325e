//! roce-verbs: the application-facing runtime (work in progress).
#![warn(missing_docs)]
