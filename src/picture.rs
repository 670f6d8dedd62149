//! A user's picture as a dataset image for `bnn predict`: PNG or JPEG, grey or colour,
//! any size, turned into what the network was trained on: 8-bit grey, light ink on a dark
//! background, `rows × cols`. Digits are prepared as MNIST's were (LeCun et al. 1998): the
//! ink's bounding box scaled to fit 20×20, keeping its aspect ratio, and placed so that its
//! centre of mass is at the centre of the 28×28 frame; other images are scaled whole.

use std::path::Path;

use image::imageops::FilterType;
use image::GrayImage;

use crate::error::{Error, Result};

/// Side of the box a digit's ink is scaled into (MNIST: 20 of 28 pixels).
const DIGIT_BOX: u32 = 20;
/// A pixel counts as ink for the bounding box above this level (of 255).
const INK: u8 = 30;

/// A picture prepared for the network.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// `rows × cols` grey levels, row-major.
    pub pixels: Vec<u8>,
    /// What was done that a user should know (resized, inverted).
    pub notes: Vec<String>,
}

/// How the training images were framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// MNIST: ink box to 20×20, centre of mass at the centre.
    Digit,
    /// The whole picture scaled to the frame (Fashion-MNIST's products fill it).
    Whole,
}

/// Reads the picture at `path` and prepares it as a `rows × cols` image.
pub fn load(path: &Path, rows: usize, cols: usize, framing: Framing) -> Result<Prepared> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let name = path.display();
    if bytes.is_empty() {
        return Err(Error::Data(format!("{name}: empty file, not an image")));
    }
    let picture = image::load_from_memory(&bytes)
        .map_err(|e| Error::Data(format!("{name}: not a PNG or JPEG image ({e})")))?;
    prepare(picture.to_luma8(), rows, cols, framing)
}

/// Prepares a grey picture (see the module doc).
pub fn prepare(
    mut grey: GrayImage,
    rows: usize,
    cols: usize,
    framing: Framing,
) -> Result<Prepared> {
    let (w, h) = grey.dimensions();
    if w == 0 || h == 0 {
        return Err(Error::Data("the image has no pixels".into()));
    }
    let mut notes = Vec::new();
    // A light background (the frame's mean above mid-grey): dark ink on paper, inverted.
    let frame: Vec<u8> = grey
        .enumerate_pixels()
        .filter(|(x, y, _)| *x == 0 || *y == 0 || *x + 1 == w || *y + 1 == h)
        .map(|(_, _, p)| p.0[0])
        .collect();
    let frame_mean = frame.iter().map(|&p| p as f64).sum::<f64>() / frame.len() as f64;
    if frame_mean > 127.5 {
        image::imageops::invert(&mut grey);
        notes.push("light background: inverted".to_string());
    }
    let (rows32, cols32) = (rows as u32, cols as u32);
    if (w, h) == (cols32, rows32) {
        // Already the network's size: as a dataset image would be.
        return Ok(Prepared {
            pixels: grey.into_raw(),
            notes,
        });
    }
    notes.push(format!("resized from {w}×{h} to {cols}×{rows}"));
    let pixels = match framing {
        Framing::Whole => {
            image::imageops::resize(&grey, cols32, rows32, FilterType::Triangle).into_raw()
        }
        Framing::Digit => frame_digit(&grey, rows, cols),
    };
    Ok(Prepared { pixels, notes })
}

/// The ink's bounding box scaled into [`DIGIT_BOX`] and centred by its centre of mass.
fn frame_digit(grey: &GrayImage, rows: usize, cols: usize) -> Vec<u8> {
    let (w, h) = grey.dimensions();
    let ink: Vec<(u32, u32)> = grey
        .enumerate_pixels()
        .filter(|(_, _, p)| p.0[0] > INK)
        .map(|(x, y, _)| (x, y))
        .collect();
    let (x0, x1, y0, y1) = match ink.is_empty() {
        true => (0, w - 1, 0, h - 1),
        false => ink
            .iter()
            .fold((u32::MAX, 0, u32::MAX, 0), |(a, b, c, d), &(x, y)| {
                (a.min(x), b.max(x), c.min(y), d.max(y))
            }),
    };
    let (bw, bh) = (x1 - x0 + 1, y1 - y0 + 1);
    let crop = image::imageops::crop_imm(grey, x0, y0, bw, bh).to_image();
    let scale = DIGIT_BOX as f64 / bw.max(bh) as f64;
    let (sw, sh) = (
        ((bw as f64 * scale).round() as u32).clamp(1, DIGIT_BOX),
        ((bh as f64 * scale).round() as u32).clamp(1, DIGIT_BOX),
    );
    let digit = image::imageops::resize(&crop, sw, sh, FilterType::Triangle);
    // Centre of mass of the scaled digit, moved to the frame's centre.
    let (mut mass, mut mx, mut my) = (0.0, 0.0, 0.0);
    for (x, y, p) in digit.enumerate_pixels() {
        let v = p.0[0] as f64;
        mass += v;
        mx += v * x as f64;
        my += v * y as f64;
    }
    let (cx, cy) = match mass > 0.0 {
        true => (mx / mass, my / mass),
        false => ((sw as f64 - 1.0) / 2.0, (sh as f64 - 1.0) / 2.0),
    };
    let left = ((cols as f64 - 1.0) / 2.0 - cx).round() as i64;
    let top = ((rows as f64 - 1.0) / 2.0 - cy).round() as i64;
    let mut out = vec![0u8; rows * cols];
    for (x, y, p) in digit.enumerate_pixels() {
        let (ox, oy) = (left + x as i64, top + y as i64);
        if ox >= 0 && oy >= 0 && (ox as usize) < cols && (oy as usize) < rows {
            out[oy as usize * cols + ox as usize] = p.0[0];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bar of ink in the top-left of a large white page: inverted, framed in 20×20 and
    /// centred.
    #[test]
    fn a_large_light_picture_is_inverted_boxed_and_centred() {
        let mut page = GrayImage::from_pixel(300, 200, image::Luma([250]));
        for y in 10..110 {
            for x in 20..45 {
                page.put_pixel(x, y, image::Luma([0]));
            }
        }
        let p = prepare(page, 28, 28, Framing::Digit).unwrap();
        assert_eq!(p.notes.len(), 2, "{:?}", p.notes);
        // The bar (25 × 100) becomes 5 × 20, its centre at (13.5, 13.5) ± half a pixel.
        let (mut mass, mut mx, mut my, mut rows_with_ink) = (0.0, 0.0, 0.0, 0);
        for y in 0..28 {
            let row = &p.pixels[y * 28..(y + 1) * 28];
            rows_with_ink += row.iter().any(|&v| v > 128) as usize;
            for (x, &v) in row.iter().enumerate() {
                mass += v as f64;
                mx += v as f64 * x as f64;
                my += v as f64 * y as f64;
            }
        }
        assert_eq!(rows_with_ink, 20);
        assert!((mx / mass - 13.5).abs() <= 0.6 && (my / mass - 13.5).abs() <= 0.6);
    }

    #[test]
    fn a_dataset_sized_dark_picture_is_unchanged() {
        let mut img = GrayImage::new(28, 28);
        img.put_pixel(3, 4, image::Luma([200]));
        let p = prepare(img.clone(), 28, 28, Framing::Digit).unwrap();
        assert_eq!(p.pixels, img.into_raw());
        assert!(p.notes.is_empty());
    }
}
