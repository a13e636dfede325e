//! roce-wire (under construction)
