//! PID 1 duties, on the binary: orphans are reaped (and are not when the test flag turns the
//! reaper off), and SIGTERM stops the processes' groups before the agent exits.
