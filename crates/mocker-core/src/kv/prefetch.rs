//! A cache hint for the KV indices' batched walks, which know the next blocks' addresses
//! before they need their contents.

/// Asks for the cache line holding `x` ahead of its use: a hint, with no effect on what
/// any code computes.
#[inline(always)]
pub fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing into the program and cannot fault.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((x as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}
