"""Reading documents: finding files, extracting their text, splitting it into chunks, and
planning which files a build must embed."""
