//! roce-proto: the sans-IO RoCE v2 engine (requester, responder, verbs objects). Under construction.
#![forbid(unsafe_code)]

pub mod time;
