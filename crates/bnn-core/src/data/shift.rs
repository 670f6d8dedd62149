//! Distribution shift for `bnn eval --shift rotate`: test images rotated about their centre
//! by bilinear interpolation, the blank border filling in where the rotation reaches
//! outside the image (Ovadia et al. 2019 rotate MNIST by 0°…180° in 15° steps).

use super::Split;

/// The angles, in degrees, of `--shift rotate`.
pub fn rotation_angles() -> Vec<f64> {
    (0..=12).map(|k| 15.0 * k as f64).collect()
}

/// `split` with every image turned counter-clockwise by `degrees` (bytes in, bytes out:
/// rounded to the nearest level, so that scaling or standardisation applies as to any
/// image). 0° returns the images unchanged.
pub fn rotated(split: &Split, degrees: f64) -> Split {
    let (rows, cols) = (split.rows, split.cols);
    let d = split.dim();
    let mut images = split.images.clone();
    if degrees.rem_euclid(360.0) != 0.0 {
        let (sin, cos) = degrees.to_radians().sin_cos();
        let (cy, cx) = ((rows as f64 - 1.0) / 2.0, (cols as f64 - 1.0) / 2.0);
        // For each output pixel, where it comes from: the inverse rotation. Rows grow
        // downwards, so counter-clockwise on screen is clockwise in (row, col).
        let taps: Vec<Option<[(usize, f64); 4]>> = (0..d)
            .map(|o| {
                let (y, x) = ((o / cols) as f64 - cy, (o % cols) as f64 - cx);
                let sx = cos * x - sin * y + cx;
                let sy = sin * x + cos * y + cy;
                bilinear_taps(sy, sx, rows, cols)
            })
            .collect();
        for (out, src) in images.chunks_exact_mut(d).zip(split.images.chunks_exact(d)) {
            for (o, tap) in out.iter_mut().zip(&taps) {
                *o = match tap {
                    None => 0,
                    Some(t) => {
                        let v: f64 = t.iter().map(|&(i, w)| w * src[i] as f64).sum();
                        v.round().clamp(0.0, 255.0) as u8
                    }
                };
            }
        }
    }
    Split {
        features: Vec::new(),
        values: Vec::new(),
        images,
        labels: split.labels.clone(),
        rows,
        cols,
        standardization: split.standardization.clone(),
    }
}

/// The four neighbours of (y, x) and their bilinear weights; pixels outside the image
/// count as 0 (weight kept on index 0 with weight 0). `None` when the point is wholly
/// outside.
fn bilinear_taps(y: f64, x: f64, rows: usize, cols: usize) -> Option<[(usize, f64); 4]> {
    if y <= -1.0 || x <= -1.0 || y >= rows as f64 || x >= cols as f64 {
        return None;
    }
    let (y0, x0) = (y.floor(), x.floor());
    let (fy, fx) = (y - y0, x - x0);
    let mut taps = [(0usize, 0.0f64); 4];
    for (k, (dy, dx)) in [(0, 0), (0, 1), (1, 0), (1, 1)].into_iter().enumerate() {
        let (yy, xx) = (y0 as i64 + dy, x0 as i64 + dx);
        let w = (if dy == 1 { fy } else { 1.0 - fy }) * (if dx == 1 { fx } else { 1.0 - fx });
        if yy >= 0 && xx >= 0 && (yy as usize) < rows && (xx as usize) < cols {
            taps[k] = (yy as usize * cols + xx as usize, w);
        }
    }
    Some(taps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_of(image: Vec<u8>, rows: usize, cols: usize) -> Split {
        Split {
            features: Vec::new(),
            values: Vec::new(),
            images: image,
            labels: vec![0],
            rows,
            cols,
            standardization: None,
        }
    }

    #[test]
    fn quarter_turns_move_pixels_exactly() {
        // A 3×3 image with one bright pixel right of centre.
        let mut img = vec![0u8; 9];
        img[5] = 200; // row 1, col 2
        let s = split_of(img, 3, 3);
        // Counter-clockwise by 90°: right of centre goes to above centre (row 0, col 1).
        let r = rotated(&s, 90.0);
        let mut want = vec![0u8; 9];
        want[1] = 200;
        assert_eq!(r.images, want);
        // 180°: to the left of centre.
        let r = rotated(&s, 180.0);
        let mut want = vec![0u8; 9];
        want[3] = 200;
        assert_eq!(r.images, want);
        assert_eq!(rotated(&s, 0.0).images, s.images);
    }

    #[test]
    fn rotation_keeps_the_ink_of_a_centred_blob_and_the_angles_are_ovadias() {
        let (rows, cols) = (28, 28);
        let img: Vec<u8> = (0..rows * cols)
            .map(|o| {
                let (y, x) = ((o / cols) as f64 - 13.5, (o % cols) as f64 - 13.5);
                (255.0 * (-(y * y + 4.0 * x * x) / 30.0).exp()).round() as u8
            })
            .collect();
        let s = split_of(img, rows, cols);
        let ink = |v: &[u8]| v.iter().map(|&p| p as f64).sum::<f64>();
        for angle in rotation_angles() {
            let r = rotated(&s, angle);
            // Interpolation blurs a little; the blob stays inside, so the ink stays
            // within 3% (rounding of ~100 pixels to whole levels, and the blur).
            let rel = (ink(&r.images) - ink(&s.images)).abs() / ink(&s.images);
            assert!(rel < 0.03, "{angle}°: ink changed by {rel}");
        }
        assert_eq!(rotation_angles().len(), 13);
        assert_eq!(*rotation_angles().last().unwrap(), 180.0);
    }
}
