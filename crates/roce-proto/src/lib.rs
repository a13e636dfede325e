//! roce-proto (under construction)
