//! The `heap_sites` fixture's ground truth (tests/fixtures/heap_sites.c: what each site
//! allocates, by construction) and the checks of a decoded heap profile against it: per-site
//! values within a tolerance, the site as leaf frame, the `bytes` label.

use crate::expect::within;
use crate::pprof::Profile;

/// With every allocation recorded, 1% is the requirement.
pub const EXACT_TOLERANCE: f64 = 0.01;

/// What one site of heap_sites.c allocates, as the profile should count it.
pub struct Site {
    pub name: &'static str,
    pub alloc_objects: i64,
    pub alloc_space: i64,
    pub inuse_objects: i64,
    pub inuse_space: i64,
}

const KIB: i64 = 1024;
const MIB: i64 = 1024 * KIB;

/// The truth, from the table at the top of tests/fixtures/heap_sites.c.
pub const SITES: [Site; 16] = [
    site("site_malloc_live", 1000, 1000, true),
    site("site_calloc_live", 200, 16 * 256, true),
    site("site_freed", 2000, 4096, false),
    // realloc(NULL, 10 KiB), then 10 KiB steps to 1000 KiB: each call frees the old block
    // and allocates the new one (alloc = 10 KiB × (1 + 2 + … + 100)); only the last is live.
    Site {
        name: "site_realloc_grow",
        alloc_objects: 100,
        alloc_space: 10 * KIB * 5050,
        inuse_objects: 1,
        inuse_space: 1000 * KIB,
    },
    site("site_memalign_live", 100, 3000, true),
    site("site_mid_live", 512, 64 * KIB, true),
    Site {
        name: "site_big_live",
        alloc_objects: 12,
        alloc_space: 4 * 8 * MIB + 8 * 2 * MIB,
        inuse_objects: 12,
        inuse_space: 4 * 8 * MIB + 8 * 2 * MIB,
    },
    site("site_aligned_mid_live", 1024, 32 * KIB, true),
    site("site_reallocarray_mid_live", 1024, 32 * KIB, true),
    site("site_aligned_alloc_live", 50, 4096, true),
    site("site_memalign_old_live", 50, 2000, true),
    site("site_valloc_live", 20, 5000, true),
    // pvalloc rounds up to whole pages, and that is what it allocates.
    site("site_pvalloc_live", 20, 8192, true),
    site("site_reallocarray_live", 30, 10 * 100, true),
    // Each block is freed by realloc(p, 0), which allocates nothing.
    site("site_realloc_to_zero", 50, 2000, false),
    // Failed allocations and free(NULL) count nothing.
    site("site_failed", 0, 0, false),
];

/// A site of `count` blocks of `size` bytes, kept live or all freed.
const fn site(name: &'static str, count: i64, size: i64, kept: bool) -> Site {
    let live = if kept { 1 } else { 0 };
    Site {
        name,
        alloc_objects: count,
        alloc_space: count * size,
        inuse_objects: count * live,
        inuse_space: count * size * live,
    }
}

pub fn truth_of(name: &str) -> &'static Site {
    SITES.iter().find(|s| s.name == name).expect("a site of SITES")
}

/// Value `type_name` summed over the samples whose stack holds `site`. Sites never call
/// each other, so a sample belongs to at most one.
pub fn site_value(profile: &Profile, site: &str, type_name: &str) -> i64 {
    profile.value_where(type_name, |s| s.contains(site))
}

/// All four values of `site` within 1%; a site with nothing live exactly 0 in use.
pub fn site_values_match(profile: &Profile, site: &Site) {
    let pairs = [
        ("alloc_objects", site.alloc_objects),
        ("alloc_space", site.alloc_space),
        ("inuse_objects", site.inuse_objects),
        ("inuse_space", site.inuse_space),
    ];
    for (type_name, truth) in pairs {
        let got = site_value(profile, site.name, type_name);
        let what = format!("{} {type_name}", site.name);
        if truth == 0 {
            assert_eq!(got, 0, "{what}: expected 0; {}", site_breakdown(profile, site.name));
        } else if got == 0 {
            panic!(
                "{what}: expected {truth}, got 0 \
                 (did the probes attach only after the fixture allocated?)"
            );
        } else {
            within(got, truth, EXACT_TOLERANCE, &what);
        }
    }
}

pub fn alloc_space_matches(profile: &Profile, site: &Site) {
    let got = site_value(profile, site.name, "alloc_space");
    let what = format!("{} alloc_space", site.name);
    within(got, site.alloc_space, EXACT_TOLERANCE, &what);
}

/// ≥ 99% of the site's `type_name` bytes have the site as leaf frame (the frame under the
/// allocator), and those samples carry site → main.
pub fn site_is_leaf_and_chained(profile: &Profile, site: &str, type_name: &str) {
    let total = site_value(profile, site, type_name);
    let leaf = profile.value_where(type_name, |s| s.leaf_is(site));
    let chained = profile.value_where(type_name, |s| s.leaf_is(site) && s.has_chain(&[site, "main"]));
    assert!(
        leaf as f64 >= 0.99 * total as f64,
        "only {leaf} of {total} {type_name} bytes in {site} have it as leaf frame; {}",
        site_breakdown(profile, site)
    );
    assert_eq!(
        chained,
        leaf,
        "samples with leaf {site} lack the chain {site} → main; {}",
        site_breakdown(profile, site)
    );
}

/// The `bytes` label of the site's samples is its average block size.
pub fn average_size_label(profile: &Profile, site: &str, bytes: i64) {
    for sample in profile.samples.iter().filter(|s| s.contains(site)) {
        assert_eq!(sample.label_num_unit("bytes"), Some((bytes, Some("bytes"))), "bytes label of {:?}", sample.names());
    }
}

/// The samples holding `site`, for failure messages.
fn site_breakdown(profile: &Profile, site: &str) -> String {
    let lines: Vec<String> = profile
        .samples
        .iter()
        .filter(|s| s.contains(site))
        .map(|s| format!("  {:?} {:?}", s.values, s.names()))
        .collect();
    format!("samples holding {site} (alloc_objects, alloc_space, inuse_objects, inuse_space):\n{}", lines.join("\n"))
}
