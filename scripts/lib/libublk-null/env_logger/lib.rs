//! A stand-in for env_logger 0.9 (not in the offline registry): logging stays off.
pub struct Builder;
pub enum TimestampPrecision {
    Seconds,
}
pub fn builder() -> Builder {
    Builder
}
impl Builder {
    pub fn format_target(&mut self, _: bool) -> &mut Self {
        self
    }
    pub fn format_timestamp(&mut self, _: Option<TimestampPrecision>) -> &mut Self {
        self
    }
    pub fn init(&mut self) {}
}
