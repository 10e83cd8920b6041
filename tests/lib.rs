//! Native test processes shared by the integration tests.
