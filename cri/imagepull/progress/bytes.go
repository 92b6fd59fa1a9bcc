package progress

import "fmt"

// Bytes is a size or a count of bytes. It is written in binary units, as kubectl and crictl
// write sizes, so that what podgate says of a pull reads like what they say of the image.
type Bytes int64

// String writes b as kubectl does, with a space before the unit: "512 B", "1.5 MiB".
func (b Bytes) String() string { return b.format(" ") }

// Short writes b as crictl images' columns do, without the space: "512B", "1.5MiB".
func (b Bytes) Short() string { return b.format("") }

func (b Bytes) format(sep string) string {
	const unit = 1024
	n := int64(b)
	if n < unit {
		return fmt.Sprintf("%d%sB", n, sep)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%s%ciB", float64(n)/float64(div), sep, "KMGTPE"[exp])
}
