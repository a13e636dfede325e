//! roce-link (under construction)
