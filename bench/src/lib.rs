//! rblk-bench: a fio-style load generator for rblk volumes (workloads, queue depth, jobs,
//! latency histograms). Built on the initiator library once sessions exist; the binary only
//! states that today.

#![forbid(unsafe_code)]
