//! A stand-in for daemonize 0.5 (not in the offline registry): no daemon mode, use --foreground.
pub struct Daemonize;
pub struct Stdio;
impl Stdio {
    pub fn keep() -> Self {
        Stdio
    }
}
impl Daemonize {
    pub fn new() -> Self {
        Daemonize
    }
    pub fn stdout(self, _: Stdio) -> Self {
        self
    }
    pub fn stderr(self, _: Stdio) -> Self {
        self
    }
    pub fn start(self) -> Result<(), String> {
        Err("no daemon mode in this build: use --foreground".into())
    }
}
