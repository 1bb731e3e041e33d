//! The table of the slots this instance holds in its limiters' in-flight policies, and
//! its renewal rounds; the slot a request holds is a [`Permit`](crate::Permit).

mod table;

pub(super) use table::{in_flight, Home, SlotTable};
