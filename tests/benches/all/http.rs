//! placeholder

use wasmproc_tests::bench::{Options, Report};

pub(crate) fn run(_options: &Options, _report: &mut Report) {}
