#!/usr/bin/env bash
if true; then
	cat <<-EOT
	l	i	n	e	 	0	
	l	i	n	e	 	1	
	l	i	n	e	 	2	
	l	i	n	e	 	3	
	l	i	n	e	 	4	
	l	i	n	e	 	5	
	l	i	n	e	 	6	
	l	i	n	e	 	7	
	l	i	n	e	 	8	
	l	i	n	e	 	9	
	l	i	n	e	 	1	0	
	l	i	n	e	 	1	1	
	l	i	n	e	 	1	2	
	l	i	n	e	 	1	3	
	l	i	n	e	 	1	4	
	l	i	n	e	 	1	5	
	l	i	n	e	 	1	6	
	l	i	n	e	 	1	7	
	l	i	n	e	 	1	8	
	l	i	n	e	 	1	9	
	l	i	n	e	 	2	0	
	EOT
fi
